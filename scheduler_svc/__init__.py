"""Railover central service."""

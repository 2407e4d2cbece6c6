"""Railover node agent."""

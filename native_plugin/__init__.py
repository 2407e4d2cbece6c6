"""Railover native plugin: C library, wire format and Python binding."""

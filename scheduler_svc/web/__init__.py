"""The status page: templates and their server-side rendering."""

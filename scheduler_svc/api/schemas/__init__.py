"""Wire models of the v1 API, one module per resource. Field names here are a contract
with fleet managers and agents; the shared field types are in `fields`."""

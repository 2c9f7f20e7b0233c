"""The data layer: split types (``types``), sharding and batching (``sharding``), and data
larger than memory read from disk in windows of chunks (``chunked``)."""

"""Content-addressed blobs: on the local disk or in an S3-compatible store, their references and erasure."""

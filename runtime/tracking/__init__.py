"""MLflow tracking: ``client`` (store, reachability, finding a run by name), ``driver`` (the
run's lifecycle), ``worker`` (rank 0's metrics and artifacts, every node's system metrics),
``spool`` (what could not be sent, kept on disk and replayed). No module here imports one that
imports it back."""

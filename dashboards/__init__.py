"""Read-only views over the store and MLflow: the web dashboard and reports. Nothing here writes to the store."""

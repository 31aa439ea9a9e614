"""The elastic hybrid pool: roles and lifecycle (`states`), how a step's batch is shared
(`batching`), what is trained (`task`), the control plane (`control`), the worker processes and the
leader (`elastic`), the reconciler (`reconciler`), where hybrids run (`providers`) and the
coordinator (`pool`). Read in that order."""

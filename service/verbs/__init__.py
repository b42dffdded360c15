"""The operator verbs: status, show, reconcile, replay-quarantine, migrate, generate."""

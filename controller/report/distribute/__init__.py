"""`report --distributed`: the signer that enqueues report tasks, the report worker and its entry."""

"""`mlfs demo`: one end-to-end run per kind of model on the embedded default."""

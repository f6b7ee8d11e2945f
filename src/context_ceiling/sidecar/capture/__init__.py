"""The capture store's side of the sidecar: sampling exchanges, what each one says, and the secret redaction before anything is written."""

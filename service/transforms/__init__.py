"""Pure DataFrame → DataFrame functions: no reads, writes, actions or logging."""

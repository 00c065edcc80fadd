"""The human-evaluation round trip: blinded rating sheets out, returned sheets scored."""

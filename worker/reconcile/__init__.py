"""Reconciliation: the ledger against what the provider reports (docs/reconciliation.md)."""

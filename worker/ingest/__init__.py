"""Webhook ingest: the signed endpoint, the ingress process and its link."""

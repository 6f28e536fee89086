"""The service: composition root, runtime, systemd, the serve lock."""

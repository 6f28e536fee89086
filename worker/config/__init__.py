"""Configuration: settings, payer profiles and the YAML helpers they share."""

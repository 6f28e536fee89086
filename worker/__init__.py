"""depositd: merchant-side webhook receiver and Travel Rule deposit workflow worker."""

__version__ = "0.1.0"

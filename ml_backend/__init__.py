"""sense7's ML backend: personalized pre-annotations served to Label Studio (see ml_backend/README.md)."""

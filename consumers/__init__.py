"""rollstream consumers stage package."""

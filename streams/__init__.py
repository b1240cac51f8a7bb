"""rollstream streams stage package."""

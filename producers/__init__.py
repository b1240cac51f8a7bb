"""rollstream producers stage package."""

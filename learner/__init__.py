"""rollstream learner stage package."""

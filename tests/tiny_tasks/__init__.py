"""Tasks that exist only for the tests: a task of one's own, outside the package."""

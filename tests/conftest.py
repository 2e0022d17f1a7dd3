"""Shared pytest configuration. Service fixtures (PostgreSQL, SQLite, S3) live in tests/fixtures."""

pytest_plugins = ["tests.fixtures.services"]

"""The sandbox provider: a staging payments, messaging and booking provider served at /sandbox/v1/."""

"""Helpers shared by the test suites: polling assertions and etcd fixtures."""

"""Benchmarks: commands that measure, print, and save numbers (JSON) and pictures (PNG). Never tests."""

"""The heat map workload's package (tests/scripts/heat_lines.py)."""

"""The EAGLE-3 draft trainer."""

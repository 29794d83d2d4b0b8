"""The fault campaign of `ticketflow chaos` (docs/chaos.md)."""

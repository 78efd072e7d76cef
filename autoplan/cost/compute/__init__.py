"""What one op costs on one device."""

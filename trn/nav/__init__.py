"""Map-relative navigation: position fixes from recognised craters and a navigation filter."""

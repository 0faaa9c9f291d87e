"""Board-side deployment: flashing signed bundles (``trn-hw flash``) and rolling back."""

"""The board side of trn: what runs on a flight board with Python 3 and numpy only (never torch
or trn). ``trn_board.bundle`` verifies signed bundles; ``trn_board.ed25519`` checks signatures."""

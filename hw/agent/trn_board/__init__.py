"""The board side of trn: what runs on a flight board with Python 3 and numpy only (never torch
or trn). ``trn_board.ed25519`` checks signatures; ``trn_board.bundle`` verifies signed bundles;
``trn_board.trust`` holds the board's trust anchor and anti-rollback state; ``trn_board.install``
installs, rolls back and reports; ``trn_board.agent`` serves a verified bundle over TCP."""

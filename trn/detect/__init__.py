"""Crater detection: a centre-point detector for navigation frames, its training and its evaluation.

``boxes`` (numpy only: preprocessing, decoding, IoU, NMS) is what a board runs; ``model`` and
``train`` need torch; ``evaluate`` computes precision, recall and AP@0.5 as COCO defines them.
"""

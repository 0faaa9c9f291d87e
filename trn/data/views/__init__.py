"""What a descriptor sees of a crater: the crop of its box in a frame, standardised to the model's
input (:mod:`.crops`), and the augmentation family T that training and the scenarios draw from
(:mod:`.augment`)."""

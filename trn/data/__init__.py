"""The data trn reads and makes, in four rooms:

* :mod:`trn.data.catalogues`: crater catalogues and their union;
* :mod:`trn.data.views`: the crop of a box in a frame and the augmentation family T;
* :mod:`trn.data.worlds`: terrain, the renderer, the Sun, trajectories and the built-in world;
* :mod:`trn.data.datasets`: the Luna-1 format and its builder, annotation, frame-domain views, the
  detector's labels and landmark image sets.

Data flows one way, down this list: a world writes its catalogue, a dataset is built from a
world and its catalogues and cuts its views; catalogues and views import neither each other nor
a room below them (``tests/test_layering.py``). Beside the rooms: :mod:`trn.data.files` (reading
and writing with errors that name the file) and :mod:`trn.data.progress` (progress of a long
stage).
"""

"""chute: the disk side of a training run."""

"""metalearn's Hydra launcher: ``hydra/launcher=vectorized`` (see :mod:`.vectorized_launcher`)."""

"""Model folders: the offline tiny model and the one ``from_pretrained`` path every model goes through."""

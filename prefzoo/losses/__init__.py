"""Built-in losses, one module per family.  They register through the ``prefzoo_register_losses`` hook."""

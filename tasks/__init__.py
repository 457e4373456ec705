"""Built-in task plugins; each module is registered through the same hooks as third-party plugins."""

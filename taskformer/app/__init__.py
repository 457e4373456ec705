"""The application around the core and the plugins: the ``taskformer`` command line (``cli``), the
glue that trains, evaluates and predicts through the hooks (``runner``), report rendering
(``report``), the multi-process launcher (``distributed``) and the plugin scaffold (``scaffold``)."""

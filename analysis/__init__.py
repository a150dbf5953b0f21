"""Analysis of experiment records: loaders, tables and (later) figures and notebooks."""

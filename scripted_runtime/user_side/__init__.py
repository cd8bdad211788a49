"""Code that runs in the user's process: starting and stopping servers,
sending scripts over the protocol, builds and A/B, the explorer's search,
the command line and trace rendering. Nothing here runs under the frozen
scheduler."""

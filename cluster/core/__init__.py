"""The bottom floor: the values that cross every stage (types), the one error of bad input,
command placeholders, limits, encodings, the occupancy calculator and the plug-in registries.
Nothing here imports the config, the agents or the engine."""

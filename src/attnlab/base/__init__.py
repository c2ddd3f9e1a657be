"""What every layer of attnlab may use: errors and exit codes, atomic files, safe paths,
optional extras, finite checks, device names, the strict config section, warning lines.
Nothing here imports another attnlab package."""

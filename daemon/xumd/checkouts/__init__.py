"""What a checkout is, below the features that change it: its identity (the row's reference and
the marker on disk) and the exclusion every feature takes before it touches a checkout's path.
Lifecycle and cleanup both build on this package; it imports neither."""

// Implemented by the spec work.

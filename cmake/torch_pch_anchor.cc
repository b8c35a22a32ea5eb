// The translation unit that owns the precompiled libtorch header (cmake/Pch.cmake): it has
// no code of its own; every target that sees libtorch's headers reuses its header unit.

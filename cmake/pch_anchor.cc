// The translation unit that owns a precompiled header (cmake/Pch.cmake): it has no code of its
// own; every target of the header's family reuses its header unit.

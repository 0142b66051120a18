"""The table strategies (LeastKey, LeastCount, Weight) and their bounded form, and the key
overlay a fluid swap places with."""

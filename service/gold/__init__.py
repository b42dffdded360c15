"""The gold queries: windows, joins and alerts over the silver stream."""

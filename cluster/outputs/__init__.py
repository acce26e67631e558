"""What a run gives its users: the selection, the export formats (one registry), the portability
comparison, the reports and their plots."""

"""The timetick step: allocates timeticks and keeps the acknowledged-timetick horizon."""

// The types every data model shares (``SnapshotMetadata``, ``MaintenanceRun``) are part of
// this module's API.
@_exported import FerryStore
